"""Vision Transformer (Dosovitskiy et al. 2021): class token, learned position embedding.

Layout as big_vision / timm's `vit_*_patch16_224`, so ViT-B/16 at 224 px with 1000 classes has
86,567,656 parameters and ViT-S/16 22,050,664: a stride-p conv patch embedding, a prepended
class token, learned position embeddings for every token, pre-LayerNorm encoder blocks
(multi-head self-attention and a GELU MLP, each with a residual), a final LayerNorm, and a Dense
'head' on the class token.
"""
import flax.linen as nn
import jax.numpy as jnp

from calib_jax.models import layers

Array = layers.Array

# variant -> (hidden size, depth, heads, MLP size)
VIT_VARIANTS = {
    "ti": (192, 12, 3, 768),
    "s": (384, 12, 6, 1536),
    "b": (768, 12, 12, 3072),
}

_LN_EPSILON = 1e-6


class MlpBlock(nn.Module):
  """Dense - GELU - dropout - Dense - dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    dense = lambda features, name: nn.Dense(
        features, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(1e-6), name=name)
    y = nn.gelu(dense(self.mlp_dim, "fc1")(x), approximate=False)
    y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    y = dense(x.shape[-1], "fc2")(y)
    return nn.Dropout(self.dropout_rate, deterministic=not train)(y)


class EncoderBlock(nn.Module):
  """Pre-LN transformer block: x + MHSA(LN(x)), then x + MLP(LN(x))."""
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    y = nn.LayerNorm(epsilon=_LN_EPSILON, dtype=self.dtype, name="norm1")(x)
    y = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype, dropout_rate=self.attention_dropout_rate,
        deterministic=not train, kernel_init=nn.initializers.xavier_uniform(),
        name="attention")(y, y)
    x = x + nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    y = nn.LayerNorm(epsilon=_LN_EPSILON, dtype=self.dtype, name="norm2")(x)
    return x + MlpBlock(self.mlp_dim, self.dropout_rate, dtype=self.dtype, name="mlp")(y, train)


class ViT(nn.Module):
  """Vision Transformer classifier.

  Attributes:
    num_classes: number of output logits.
    patch_size: side of the square patches (16 for ImageNet-size inputs, 4 for 32x32 / 64x64).
    hidden_size, depth, num_heads, mlp_dim: transformer size (see `VIT_VARIANTS`).
    image_size: input side in pixels; fixes the number of position embeddings, so inputs of
      another size are rejected.
    dropout_rate: dropout after the position embedding, attention output and MLP layers.
    attention_dropout_rate: dropout on the attention weights.
    dtype: computation dtype; parameters and logits are float32.
    axis_name: accepted for a uniform model interface; unused (no BatchNorm).
  """
  num_classes: int
  patch_size: int = 16
  hidden_size: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  image_size: int = 224
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if self.image_size % self.patch_size:
      raise ValueError(f"image_size {self.image_size} is not a multiple of the patch size "
                       f"{self.patch_size}")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
    super().__post_init__()

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    """Maps images [B, image_size, image_size, C] to float32 logits [B, num_classes]."""
    layers.check_image_batch(x, "ViT")
    if x.shape[1:3] != (self.image_size, self.image_size):
      raise ValueError(f"ViT was built for {self.image_size}x{self.image_size} inputs (pass "
                       f"image_size=...), got {x.shape[1]}x{x.shape[2]}")
    p = self.patch_size
    x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding="VALID", dtype=self.dtype,
                name="patch_embedding")(x.astype(self.dtype))
    batch = x.shape[0]
    x = x.reshape(batch, -1, self.hidden_size)
    cls = self.param("cls_token", nn.initializers.zeros, (1, 1, self.hidden_size))
    x = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, self.hidden_size)).astype(x.dtype), x],
                        axis=1)
    pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1,) + x.shape[1:])
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x + pos.astype(x.dtype))
    for i in range(self.depth):
      x = EncoderBlock(self.num_heads, self.mlp_dim, self.dropout_rate,
                       self.attention_dropout_rate, dtype=self.dtype,
                       name=f"encoderblock_{i}")(x, train)
    x = nn.LayerNorm(epsilon=_LN_EPSILON, dtype=self.dtype, name="encoder_norm")(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x[:, 0]))
