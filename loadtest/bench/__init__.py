"""`make bench`: the broker against baselines measured in the same run, printed as ratios.

Load comes from the C generators in loadtest/ (a Python client reaches only a fraction of what
a uvloop server serves on this 2-core machine).  One module per scenario:

  requests  rrclient request rates against the broker and against loadtest/echo_server.py;
  accepts   connclient accept rates against the broker and loadtest/accept_close_server.py;
  fairness  p99 latency of existing connections during a storm of new ones (KIP-402, KIP-612);
  memory    peak resident memory under a burst of 1 MiB Produce requests (KIP-72 pool);
  control   admin request latency on the control plane while the data plane is saturated (KIP-291);
  events    the cost of the event log, and (pipeline) the PySpark pipeline's throughput;
  groups    consumer-group join time and OffsetCommit round trips;
  log       confluent-kafka produce and consume throughput and broker CPU per MB;
  security  TLS and SASL costs: requests, produce and handshakes over SSL against PLAINTEXT,
            SCRAM authentications per second (loadtest/secure_client.py, a uvloop client).

common holds what they share (frames, server wrappers, CPU accounting, rrclient), report the
goals and the printed table, and __main__ the runner (`python -m loadtest.bench`).

Every configuration runs once per pass, passes interleave, and ratios are taken within a pass;
the table shows medians (min-max).  Exit status 1 if a target is missed or a client saw errors.
"""
