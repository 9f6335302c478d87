"""What the benchmark scripts and the tests share: the server client (``client``), images
(``images``), the server's counters (``counters``), the machine (``hardware``) and the output
(``report``)."""
