// Command dashboard-check validates Grafana dashboard JSON files against the dashboard schema as
// the grafana-foundation-sdk's Go types carry it (generated from Grafana's own schema): strict
// decoding refuses a missing required field, a field of the wrong type and a field the schema
// does not know, in the dashboard, in every panel's options and field config (by panel type),
// and in every Prometheus query; then each type's Validate checks its constraints.
//
// Usage: dashboard-check FILE.json...   (exit 1 and one line per problem when any file fails)
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var board dashboard.Dashboard
	if err := board.UnmarshalJSONStrict(raw); !isEmpty(err) {
		return err
	}
	if err := board.Validate(); !isEmpty(err) {
		return err
	}
	return nil
}

// isEmpty: no error. The SDK's strict decoders return their error list as it stands, so "no
// error" comes back as a non-nil error interface holding an empty cog.BuildErrors.
func isEmpty(err error) bool {
	var list cog.BuildErrors
	if errors.As(err, &list) {
		return len(list) == 0
	}
	return err == nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check FILE.json...")
		os.Exit(2)
	}
	// Panel options, field configs and queries are decoded by the types of their panel and
	// data source: without the plugins they would pass as opaque JSON.
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
