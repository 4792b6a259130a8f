"""Gates: declared in gates/*.yaml, run by polyforge.gates.runner, one module per kind."""
