"""The outputs of a pod's run, what it leaves on disk: output layouts and part files (layouts), whether an
item on disk was made for this request (requests), media encoding (media, thumbnails), writer threads and
atomic files (writer, temps), shards, and the job's merge into one manifest, index and gallery (merge,
gallery, gallery_cards)."""
