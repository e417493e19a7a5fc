"""One module per failure domain; each declares its scenarios with :func:`torchdoctor.lab.scenario`.

Scenario bodies run only in the lab's child process: they may import torch, lower limits and crash.
"""
