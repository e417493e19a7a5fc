"""``python -m torchdoctor.dist [OPTIONS]``: the same as ``torchdoctor dist [OPTIONS]``; under torchrun,
srun or another launcher (RANK/WORLD_SIZE set) it is one rank of the smoke test."""

from ..cli import main

main(["dist", *__import__("sys").argv[1:]])
