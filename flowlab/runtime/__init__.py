"""Runtime: the array backend (NumPy or CuPy), the session that holds variables, and the executor."""
