"""Flower's quickstart-pytorch, on the local Fashion-MNIST, with fedflex's strategies."""
