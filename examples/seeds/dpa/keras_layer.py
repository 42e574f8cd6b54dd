"""DPA guide, "Integration Examples: TensorFlow/Keras": a Keras augmentation layer.

Runs where TensorFlow is installed; elsewhere it prints why it is skipped and exits 0.
rankwise does not need TensorFlow: the parameters are plain Python floats.

    python examples/seeds/dpa/keras_layer.py

The guide's layer does not run as printed, so the port changes three things (lines marked
"port:"):

- Its rank lookup, ``strategy.extended.worker_devices.index(
  tf.config.experimental.get_device_name())``, calls a function TensorFlow does not have.
  The port takes the worker's task id from the strategy's cluster resolver
  (``MultiWorkerMirroredStrategy``), or 0 in a single-worker strategy.
- ``apply_augmentations`` is left undefined; the port applies brightness, contrast and
  Gaussian noise (seeded by the sample's DPA hash) with plain TensorFlow ops.
- The guide never calls the layer; the port calls it eagerly on 4 random images.
"""

import sys

try:
    import tensorflow as tf
except ImportError:
    print(
        "SKIPPED: TensorFlow is not installed (pip install tensorflow to run this example); "
        "rankwise itself does not need it."
    )
    sys.exit(0)

from rankwise.compat.dpa import gen_distributed_augmentation_params, get_preset


class DistributedAugmentationLayer(tf.keras.layers.Layer):
    """Custom Keras layer for distributed augmentation."""

    def __init__(self, config, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.config = config

        # Get distributed training info
        strategy = tf.distribute.get_strategy()
        resolver = getattr(strategy, "cluster_resolver", None)  # port: see the docstring
        task_id = getattr(resolver, "task_id", None)
        self.rank = int(task_id) if task_id is not None else 0
        self.world_size = strategy.num_replicas_in_sync

    def call(self, inputs, sample_ids):  # type: ignore[no-untyped-def]
        """Apply distributed augmentations."""
        augmented_batch = []

        for i, sample_id in enumerate(sample_ids):
            params = gen_distributed_augmentation_params(
                sample_id=sample_id.numpy(),
                rank=self.rank,
                config=self.config,
                world_size=self.world_size,
            )

            # Apply augmentations to inputs[i] using params
            augmented = self.apply_augmentations(inputs[i], params)
            augmented_batch.append(augmented)

        return tf.stack(augmented_batch)

    def apply_augmentations(self, image, params):  # type: ignore[no-untyped-def]
        # port: the guide leaves this undefined
        image = tf.cast(image, tf.float32) * params["brightness"]
        mean = tf.reduce_mean(image)
        image = mean + params["contrast"] * (image - mean)
        seed = [int(params["hash"][:8], 16), int(params["hash"][8:16], 16)]
        noise = tf.random.stateless_normal(tf.shape(image), seed=seed)
        return image + params["noise"] * noise


if __name__ == "__main__":  # port: run the layer once
    layer = DistributedAugmentationLayer(get_preset("mild"))
    images = tf.random.stateless_uniform((4, 8, 8, 3), seed=[0, 1])
    out = layer(images, tf.range(4, dtype=tf.int64))
    again = layer(images, tf.range(4, dtype=tf.int64))
    print(
        f"augmented batch: {tuple(out.shape)}, deterministic: {bool(tf.reduce_all(out == again))}"
    )
