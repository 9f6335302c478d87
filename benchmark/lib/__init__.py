"""What the benchmark scripts and the tests share: the server client (``client``), images
(``images``), the server's counters (``counters``), the machine and its processes
(``hardware``), checkpoints of real shapes with random weights (``shaped_checkpoints``) and the
output (``report``)."""
