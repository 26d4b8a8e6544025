"""Input pipelines: a registry of datasets, tf.data pipelines and box-aware crops.

```python
from calib_jax import data
data.names()                    # registry keys
meta = data.info("clutter_objects")
batches = data.make_dataset("clutter_objects", "train", batch_size=128, train=True, seed=0,
                            objectness=True, context_rate=0.15)
batch = next(batches)           # {'image', 'label', 'mask', 'objectness'} numpy arrays
data.objectness(boxes, crop)    # exact SPEC §4 objectness, eager on numpy
```
"""
from calib_jax.data.boxes import objectness
from calib_jax.data.checks import DataError
from calib_jax.data.pipeline import PipelineOptions, make_dataset
from calib_jax.data.registry import DatasetMeta, info, names

__all__ = ["DataError", "DatasetMeta", "PipelineOptions", "info", "make_dataset", "names",
           "objectness"]
