"""The planner's figures for models it can name without reading them: the public models Muralist's
docs use and the built-in tiny ones.

The operator has neither the model's files nor the hub (its image holds no hub client, and a model
may live on a volume only the pods mount), so it plans an Auto job of these models from this table,
and any other model by its objective alone; the pods then confirm the plan against the real
safetensors headers before loading (planner/table.py's `confirm_problems`). `muralist plan` and
`muralist run` read the real headers first and use this table only when they cannot.

Each figure is the public checkpoint's: the parameters of each component as its safetensors headers
count them (tests/planner_models.py writes hub-shaped folders with these headers, and
tests/unit/api/planner/test_facts.py reads them back), the dtype it is stored in, and the config
fields the planner reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muralist_api.planner.facts import Component, ModelFacts, catalog_plans

_WAN_VAE = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "temperal_downsample": [False, True, True], "scale_factor_spatial": 8, "scale_factor_temporal": 4}
_KL_VAE = {"block_out_channels": [128, 256, 512, 512], "sample_size": 1024}
_UMT5 = {"d_model": 4096, "num_heads": 64, "num_layers": 24}


@dataclass(frozen=True)
class KnownComponent:
    name: str
    class_name: str
    parameters: int
    stored: str  # safetensors dtype of the checkpoint's files
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownModel:
    name: str
    pipeline: str
    components: tuple[KnownComponent, ...]

    def facts(self) -> ModelFacts:
        components = tuple(Component(c.name, c.class_name, c.parameters, 0, dict(c.config)) for c in self.components)
        denoiser = next((c for c in components if c.name in ("transformer", "unet")), None)
        cp, tp = catalog_plans(denoiser.class_name) if denoiser else (None, None)
        source = f"the planner's catalog figures for {self.name}"
        return ModelFacts(self.name, self.pipeline, components, source, cp, tp)


def _wan(name: str, parameters: int, heads: int, ffn: int, layers: int) -> KnownModel:
    return KnownModel(name, "WanPipeline", (
        KnownComponent("transformer", "WanTransformer3DModel", parameters, "F32", {
            "patch_size": [1, 2, 2], "num_attention_heads": heads, "attention_head_dim": 128, "in_channels": 16,
            "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": ffn, "num_layers": layers}),
        KnownComponent("text_encoder", "UMT5EncoderModel", 5_680_910_336, "F32", _UMT5),
        KnownComponent("vae", "AutoencoderKLWan", 126_892_531, "F32", _WAN_VAE),
    ))


KNOWN_MODELS: dict[str, KnownModel] = {m.name: m for m in (
    KnownModel("stabilityai/stable-diffusion-xl-base-1.0", "StableDiffusionXLPipeline", (
        KnownComponent("unet", "UNet2DConditionModel", 2_567_463_684, "F32", {
            "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280], "cross_attention_dim": 2048,
            "sample_size": 128, "in_channels": 4, "transformer_layers_per_block": [1, 2, 10]}),
        KnownComponent("text_encoder", "CLIPTextModel", 123_060_480, "F32",
                       {"hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12}),
        KnownComponent("text_encoder_2", "CLIPTextModelWithProjection", 694_659_840, "F32",
                       {"hidden_size": 1280, "num_attention_heads": 20, "num_hidden_layers": 32}),
        KnownComponent("vae", "AutoencoderKL", 83_653_863, "F32", {**_KL_VAE, "latent_channels": 4}),
    )),
    KnownModel("black-forest-labs/FLUX.1-dev", "FluxPipeline", (
        KnownComponent("transformer", "FluxTransformer2DModel", 11_901_408_320, "BF16", {
            "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
            "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
            "guidance_embeds": True}),
        KnownComponent("text_encoder", "CLIPTextModel", 123_060_480, "BF16",
                       {"hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12}),
        KnownComponent("text_encoder_2", "T5EncoderModel", 4_762_310_656, "BF16",
                       {"d_model": 4096, "num_heads": 64, "num_layers": 24}),
        KnownComponent("vae", "AutoencoderKL", 83_819_683, "F32", {**_KL_VAE, "latent_channels": 16}),
    )),
    KnownModel("black-forest-labs/FLUX.2-dev", "Flux2Pipeline", (
        KnownComponent("transformer", "Flux2Transformer2DModel", 32_221_241_600, "BF16", {
            "patch_size": 1, "in_channels": 128, "num_layers": 8, "num_single_layers": 48, "attention_head_dim": 128,
            "num_attention_heads": 48, "joint_attention_dim": 15360, "mlp_ratio": 3.0}),
        KnownComponent("text_encoder", "Mistral3ForConditionalGeneration", 24_011_361_280, "BF16",
                       {"text_config": {"hidden_size": 5120, "num_hidden_layers": 40}}),
        KnownComponent("vae", "AutoencoderKLFlux2", 84_046_115, "F32",
                       {**_KL_VAE, "latent_channels": 32, "patch_size": [2, 2]}),
    )),
    KnownModel("Qwen/Qwen-Image", "QwenImagePipeline", (
        KnownComponent("transformer", "QwenImageTransformer2DModel", 20_430_401_088, "BF16", {
            "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
            "num_attention_heads": 24, "joint_attention_dim": 3584}),
        KnownComponent("text_encoder", "Qwen2_5_VLForConditionalGeneration", 8_292_166_656, "BF16",
                       {"hidden_size": 3584, "num_hidden_layers": 28}),
        KnownComponent("vae", "AutoencoderKLQwenImage", 126_892_531, "BF16",
                       {k: v for k, v in _WAN_VAE.items() if not k.startswith("scale_factor")}),
    )),
    _wan("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", 1_418_996_800, 12, 8960, 30),
    _wan("Wan-AI/Wan2.1-T2V-14B-Diffusers", 14_288_491_584, 40, 13824, 40),
    # The built-in tiny models (runtime/muralist_runtime/model/tiny.py, bundled.py), as they are built.
    KnownModel("muralist/tiny-flux", "FluxPipeline", (
        KnownComponent("transformer", "FluxTransformer2DModel", 68_484, "F32", {
            "patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
            "num_attention_heads": 2}),
        KnownComponent("text_encoder", "CLIPTextModel", 13_152, "F32"),
        KnownComponent("text_encoder_2", "T5EncoderModel", 10_384, "F32"),
        KnownComponent("vae", "AutoencoderKL", 9_709, "F32", {"block_out_channels": [8], "sample_size": 32}),
    )),
    KnownModel("muralist/tiny-shapes-flux", "FluxPipeline", (
        KnownComponent("transformer", "FluxTransformer2DModel", 462_672, "F32", {
            "patch_size": 1, "in_channels": 16, "num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16,
            "num_attention_heads": 4}),
        KnownComponent("text_encoder", "CLIPTextModel", 11_584, "F32"),
        KnownComponent("text_encoder_2", "T5EncoderModel", 8_816, "F32"),
        KnownComponent("vae", "AutoencoderKL", 247_987, "F32", {"block_out_channels": [8, 16, 32, 32],
                                                                "sample_size": 64}),
    )),
    *(KnownModel(name, pipeline, (
        KnownComponent("transformer", "WanTransformer3DModel", parameters, "F32", {
            "patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": channels,
            "ffn_dim": 32, "num_layers": 2}),
        KnownComponent("text_encoder", "UMT5EncoderModel", 12_432, "F32"),
        KnownComponent("vae", "AutoencoderKLWan", 16_671, "F32", {
            "base_dim": 4, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "temperal_downsample": [False, True, True],
            "scale_factor_spatial": 8, "scale_factor_temporal": 4}),
    )) for name, pipeline, parameters, channels in (
        ("muralist/tiny-wan", "WanPipeline", 20_600, 4),
        ("muralist/tiny-wan-i2v", "WanImageToVideoPipeline", 21_368, 12))),
)}


def known_facts(name: str) -> ModelFacts | None:
    model = KNOWN_MODELS.get(name)
    return model.facts() if model is not None else None
