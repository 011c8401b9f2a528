"""orchestrate: the controller. It never imports TensorFlow."""

__version__ = "0.1.0"
