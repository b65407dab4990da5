"""The outputs of a pod's run, what it leaves in its output folder (whose names are those of
muralist_api.contract.output_folder): the folder opened at set-up and its job file checked (job_folder), output
layouts (layouts), a chunk's part file and the chunks of a resumed folder (parts), whether an item on disk was
made for this request (requests), media encoding (media, thumbnails), writer threads, atomic files and the job
file (writer, temps), where the files land: a volume or object storage (storage), shards, an item's checkpoint
while it renders (checkpoints), and the job's merge into one manifest, index and gallery (merge, gallery,
gallery_cards)."""
