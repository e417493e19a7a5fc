"""``torchdoctor dist``: a distributed smoke test that names the failing step, rank and host.

- :mod:`.probe`: one rank (``python -m torchdoctor.dist``): the steps, each with its deadline.
- :mod:`.launch`: ``torchdoctor dist --nproc N`` starts the ranks with torch's elastic launcher (what
  torchrun uses), in a supervised child, and reads what each rank wrote.
- :mod:`.rules`: what the records mean (pure); :mod:`.report`: the report and its renderings.
"""
