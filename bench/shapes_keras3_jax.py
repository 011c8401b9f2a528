"""The bundled example's model and data (worker/examples/shapes.py) trained by Keras 3 on the JAX
backend across the job's processes, as Keras' distribution guide writes it: the cluster from
the environment (keras.distribution.initialize()), DataParallel, each process its own shard of
NumPy arrays, the global batch split evenly. Progress through keras_progress(). For
bench/bench_tf_vs_jax.py: `job.keras: jax`, `steps:` the steps to train."""

import os


def main() -> None:
    import jax
    import keras

    from worker import keras_progress, target_steps
    from worker.examples.shapes import NUM_EXAMPLES, build_model, build_optimizer, make_images

    global_batch = int(os.environ.get("GLOBAL_BATCH", "64"))
    keras.distribution.initialize()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
    )
    process, processes = jax.process_index(), jax.process_count()
    images, labels = make_images(NUM_EXAMPLES)
    images, labels = images[process::processes], labels[process::processes]
    batch = global_batch // processes
    steps_per_epoch = len(images) // batch
    steps = target_steps(default=None) or 300
    keras.utils.set_random_seed(1)
    model = build_model()
    model.compile(
        optimizer=build_optimizer(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(images, labels, batch_size=batch, epochs=-(-steps // steps_per_epoch),
              steps_per_epoch=steps_per_epoch, callbacks=[keras_progress()], verbose=0)  # fmt: skip


if __name__ == "__main__":  # imported by tests/unit/test_bench_imports.py, where JAX may be absent
    main()
