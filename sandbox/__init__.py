"""Container lifecycle on the docker SDK: the only package that imports docker."""
