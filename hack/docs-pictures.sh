#!/usr/bin/env bash
# The docs' picture of the quickstart's gallery (docs/images/quickstart-gallery.jpg): renders the
# quickstart afresh, then a headless Chromium takes the page as a browser shows it (1000 x 720). Run it
# when the gallery's look changes; the flow diagram (docs/images/job-flow.svg) is drawn by hand.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$REPO_ROOT"
rm -rf muralist-output/quickstart
bash hack/quickstart.sh
shot=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$shot/profile" --window-size=1000,720 \
    --screenshot="$shot/gallery.png" "file://$REPO_ROOT/muralist-output/quickstart/index.html"
"$VENV/bin/python" -c "
import sys
from PIL import Image
Image.open(sys.argv[1]).convert('RGB').save(sys.argv[2], quality=88, optimize=True, progressive=True)
" "$shot/gallery.png" docs/images/quickstart-gallery.jpg
rm -rf "$shot"
echo "docs/images/quickstart-gallery.jpg"
