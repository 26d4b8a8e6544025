"""Global-pooling CNN text classifier (GPool-CNN of MbLS / focal-loss calibration, 20 Newsgroups).

Word embeddings (100-d GloVe in the papers) - stacked 1-D conv + ReLU layers with max pooling
between them - global max pooling over time - Dense-ReLU - dropout - Dense 'head'. The default
sizes follow the Keras "pretrained word embeddings" 20 Newsgroups network that the calibration
papers train: three convs of 128 filters of width 5, max pool 5 between them, a 128-wide hidden
layer. Convs and pools use 'SAME' padding (Keras: 'valid'), so any sequence length works.
"""
import os
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from calib_jax.models import layers
from calib_jax.models import weights

Array = layers.Array


class GPoolCNN(nn.Module):
  """1-D CNN with global max pooling over integer token sequences.

  Attributes:
    num_classes: number of output logits.
    vocab_size: number of rows of the embedding table; tokens must lie in [0, vocab_size).
    embed_dim: embedding width.
    filter_sizes: width of each conv layer (one layer per entry).
    num_filters: filters per conv layer.
    pool_size: max-pool window (and stride) between conv layers.
    hidden: width of the Dense layer after global pooling (0 for none).
    dropout_rate: dropout before the head.
    embedding_init: initialiser of the [vocab_size, embed_dim] table (see `gpool_cnn` for
      building one from a pretrained array or file).
    train_embedding: if False, no gradient reaches the embedding table.
    dtype: computation dtype; parameters and logits are float32.
    axis_name: accepted for a uniform model interface; unused (no BatchNorm).
  """
  num_classes: int
  vocab_size: int
  embed_dim: int = 100
  filter_sizes: Sequence[int] = (5, 5, 5)
  num_filters: int = 128
  pool_size: int = 5
  hidden: int = 128
  dropout_rate: float = 0.0
  embedding_init: Callable[..., Array] | None = None
  train_embedding: bool = True
  dtype: layers.Dtype = jnp.float32
  axis_name: str | None = None

  def __post_init__(self):
    if int(self.vocab_size) < 1 or int(self.embed_dim) < 1:
      raise ValueError(f"vocab_size and embed_dim must be positive, got {self.vocab_size}, "
                       f"{self.embed_dim}")
    if not self.filter_sizes or any(int(k) < 1 for k in self.filter_sizes):
      raise ValueError(f"filter_sizes must be a non-empty sequence of positive ints, got "
                       f"{self.filter_sizes}")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
    super().__post_init__()

  @nn.compact
  def __call__(self, tokens: Array, train: bool = False) -> Array:
    """Maps int tokens [B, T] to float32 logits [B, num_classes]."""
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"GPoolCNN expects int tokens of shape [B, T], got {tokens.dtype} "
                       f"{tuple(tokens.shape)}")
    init = {} if self.embedding_init is None else {"embedding_init": self.embedding_init}
    x = nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype, name="embedding",
                 **init)(tokens)
    if not self.train_embedding:
      x = jax.lax.stop_gradient(x)
    for i, width in enumerate(self.filter_sizes):
      if i > 0:
        x = nn.max_pool(x, (self.pool_size,), strides=(self.pool_size,), padding="SAME")
      x = nn.relu(nn.Conv(self.num_filters, (int(width),), padding="SAME", dtype=self.dtype,
                          name=f"conv{i}")(x))
    x = jnp.max(x, axis=1)
    if self.hidden:
      x = nn.relu(nn.Dense(self.hidden, dtype=self.dtype, name="dense")(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return layers.as_logits(nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x))


def embedding_initializer(table: Any) -> Callable[..., Array]:
  """An initialiser returning a copy of `table` ([V, D]), checking the requested shape."""
  table = np.asarray(table, dtype=np.float32)
  if table.ndim != 2:
    raise ValueError(f"embedding table must be [vocab_size, embed_dim], got shape {table.shape}")

  def init(key, shape, dtype=jnp.float32):
    del key  # deterministic: the table itself
    if tuple(shape) != table.shape:
      raise ValueError(f"embedding table has shape {table.shape}, the layer needs {tuple(shape)}")
    return jnp.asarray(table, dtype)

  return init


def gpool_cnn(num_classes: int, *, vocab_size: int | None = None, embed_dim: int | None = None,
              embedding: Any = None, **kw) -> GPoolCNN:
  """Builds a `GPoolCNN`, optionally initialising its embedding from a pretrained table.

  Args:
    num_classes: number of output logits.
    vocab_size: embedding rows; inferred from `embedding` when given.
    embed_dim: embedding width (default 100); inferred from `embedding` when given.
    embedding: None, a [vocab_size, embed_dim] array, or a path to one (.npy / .npz with a single
      array / msgpack from `weights.save_variables`), loaded with `weights.load_embedding`.
    **kw: other `GPoolCNN` attributes (filter_sizes, num_filters, pool_size, hidden,
      dropout_rate, train_embedding, dtype, axis_name).
  """
  if isinstance(embedding, (str, os.PathLike)):
    embedding = weights.load_embedding(embedding)
  if embedding is not None:
    table = np.asarray(embedding)
    if table.ndim != 2:
      raise ValueError(f"embedding must be [vocab_size, embed_dim], got shape {table.shape}")
    for name, given, actual in (("vocab_size", vocab_size, table.shape[0]),
                                ("embed_dim", embed_dim, table.shape[1])):
      if given is not None and given != actual:
        raise ValueError(f"{name}={given} does not match the embedding table {table.shape}")
    vocab_size, embed_dim = table.shape
    kw["embedding_init"] = embedding_initializer(table)
  if vocab_size is None:
    raise ValueError("gpool_cnn needs vocab_size=... (or an embedding table to infer it from)")
  return GPoolCNN(num_classes=num_classes, vocab_size=int(vocab_size),
                  embed_dim=100 if embed_dim is None else int(embed_dim), **kw)
