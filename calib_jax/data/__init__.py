"""Input pipelines: a registry of datasets, tf.data pipelines and box-aware crops.

```python
from calib_jax import data
data.names()                    # registry keys
meta = data.info("clutter_objects")
batches = data.make_dataset("clutter_objects", "train", batch_size=128, train=True, seed=0,
                            objectness=True, context_rate=0.15)
batches.num_examples            # examples in the split (after max_examples), before sharding
batch = next(batches)           # {'image', 'label', 'mask', 'objectness'} numpy arrays
data.num_examples("clutter_objects", "train")   # the same count without opening a stream
data.objectness(boxes, crop)    # exact objectness (docs/conventions.md#boxes-and-objectness)
```

Modules: `registry` (what each dataset is: `DatasetSpec` = `DatasetMeta` + `Source` +
`Recipe`), `options` (`PipelineOptions`), `crops` (one function per crop, named in `CROPS`),
`processors` (one per task), `pipeline` (streams, batching, `make_dataset`), `boxes` (box
geometry, objectness), `checks` (bad-data errors), `prepare` (finding / preparing tfds data),
`corrupted` (the pre-computed corrupted test sets, CIFAR-10-C and ImageNet-C).
"""
from calib_jax.data import corrupted
from calib_jax.data.boxes import objectness
from calib_jax.data.checks import DataError
from calib_jax.data.crops import CROPS
from calib_jax.data.pipeline import (Batches, EvalPipeline, PipelineOptions, eval_pipeline,
                                     make_dataset, num_examples, tfds_split)
from calib_jax.data.registry import DatasetMeta, info, names

__all__ = ["Batches", "CROPS", "corrupted", "DataError", "DatasetMeta", "EvalPipeline",
           "PipelineOptions", "eval_pipeline", "info", "make_dataset", "names", "num_examples",
           "objectness", "tfds_split"]
