"""A model's shape for the memory estimate (:mod:`rocmft.render.memfit`): the dimensions of a decoder-only
transformer with a gated MLP, read from its config.json alone (no weights, no transformers import)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.facts.modeldir import ModelDir

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer with a gated MLP (Llama, Qwen2/3, Mistral, ...).

    Attributes:
        hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, vocab_size: as in the
            model's config.json (``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``).
        tie_word_embeddings: lm_head shares the embedding matrix (no separate parameters).
        dtype: the checkpoint's dtype name (``torch_dtype``/``dtype``); informational, training loads weights in
            the compute dtype.
        qkv_bias, o_bias, mlp_bias: which Linears have a bias (Qwen2 always has q/k/v biases:
            ``transformers/models/qwen2/modeling_qwen2.py``, ``Qwen2Attention``; Llama-style models follow
            ``attention_bias``/``mlp_bias``).
        qk_norm: per-head RMSNorm on q and k (Qwen3).
        model_type: config.json's ``model_type``.
        source: the config.json read, for messages.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    model_type: str = ""
    source: str | None = None

    @property
    def q_dim(self) -> int:
        """Width of the query projection, ``num_heads × head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, ``num_kv_heads × head_dim``."""
        return self.num_kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int, bool]]:
        """The Linears of one layer: name -> (in_features, out_features, has bias)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim, self.qkv_bias),
            "k_proj": (h, self.kv_dim, self.qkv_bias),
            "v_proj": (h, self.kv_dim, self.qkv_bias),
            "o_proj": (self.q_dim, h, self.o_bias),
            "gate_proj": (h, i, self.mlp_bias),
            "up_proj": (h, i, self.mlp_bias),
            "down_proj": (i, h, self.mlp_bias),
        }

    @property
    def layer_linear_weights(self) -> int:
        """Weight elements of one layer's Linears (no biases): what quantization and autocast copies act on."""
        return sum(n_in * n_out for n_in, n_out, _ in self.linears().values())

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: Linears with biases, two RMSNorms, optional q/k norms."""
        biases = sum(n_out for _, n_out, bias in self.linears().values() if bias)
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.layer_linear_weights + biases + norms

    @property
    def embedding_params(self) -> int:
        """The input embedding matrix, ``vocab_size × hidden_size``."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The output projection's parameters (0 when tied to the embeddings)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: embeddings, layers, the final RMSNorm, lm_head unless tied."""
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + self.lm_head_params


_REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_QKV_BIAS_TYPES = ("qwen2", "qwen2_vl", "qwen2_5_vl")  # q/k/v biases hard-coded in their attention classes
_QK_NORM_TYPES = ("qwen3", "qwen3_vl", "olmo2", "gemma3", "gemma3_text")


def read_model_shape(model_dir: Path | str | ModelDir) -> ModelShape:
    """Read a model's shape from ``<model_dir>/config.json`` alone (no weights, no transformers import; a
    :class:`~rocmft.facts.modeldir.ModelDir` is read through its cache).

    Composite configs whose language model sits under ``text_config`` are read from there.

    Raises:
        ConfigError: config.json is missing, not JSON, or lacks one of hidden_size, intermediate_size,
            num_hidden_layers, num_attention_heads, vocab_size (the message names the file and the keys).
    """
    model = model_dir if isinstance(model_dir, ModelDir) else ModelDir(Path(model_dir))
    path = model.config_path
    remedy = "Point MODEL_NAME_OR_PATH at a Hugging Face model folder with a complete config.json."
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; the memory estimate reads the model's shape from it.", remedy)
    try:
        config = model.config_json()
    except (OSError, ValueError) as err:  # not JSON, not UTF-8, or JSON that is not an object
        raise ConfigError(f"{path} cannot be read as JSON: {err}", remedy) from err
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object of model settings.", remedy)
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    missing = [
        key
        for key in _REQUIRED_KEYS
        if not isinstance(config.get(key), int) or isinstance(config[key], bool) or config[key] <= 0
    ]
    odd = [key for key in ("num_key_value_heads", "head_dim") if config.get(key) is not None
           and (not isinstance(config[key], int) or isinstance(config[key], bool) or config[key] <= 0)]  # fmt: skip
    if missing or odd:
        raise ConfigError(f"{path} lacks positive integer values for: {', '.join(missing + odd)}.", remedy)
    heads = config["num_attention_heads"]
    model_type = str(config.get("model_type") or "")
    qkv_bias = model_type in _QKV_BIAS_TYPES or bool(config.get("attention_bias", False))
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16").replace("torch.", "")
    return ModelShape(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        vocab_size=config["vocab_size"],
        # transformers' own default is True, but the decoder families this targets default to False; a missing
        # key is rare (save_pretrained writes it), and False counts lm_head separately (the larger estimate).
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype,
        qkv_bias=qkv_bias,
        o_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type in _QK_NORM_TYPES,
        model_type=model_type,
        source=str(path),
    )


__all__ = ["LINEARS", "ModelShape", "read_model_shape"]
