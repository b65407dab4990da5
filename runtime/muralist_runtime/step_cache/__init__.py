"""The step cache (spec.generation.cache), one file per concern as diffusers keeps one file per cache
under its hooks: the config object built from the job's options (config), diffusers' hooks enabled on the
transformer and paused (hooks), MagCache's ratios calibrated on the job's first item (calibration), the
quality gate that renders a sample also without the cache (gate), the measures it compares with (quality:
PSNR, SSIM) and its verdict in the job folder (verdict). Its API is the API package's `step_cache` module.

Three stages use it: the model enables it (`features`) and calibrates it (`loading`), the claim loop gates
it, the merge summarises its verdict. So it sits below them in the import layers, and is handed what it
needs of them: the model's render and the job folder's storage.
"""
