"""The autoscaling simulator: a simulated PD fleet on the calibrated cost model, run in
virtual time on a synthetic or recorded trace, seen through Prometheus' eyes.

- :mod:`.trace` -- arrival traces (synthetic from documented parameters; recorded files);
- :mod:`.fleet` -- the fleet (prefill engines, step-skipping decode engines, pods that
  take a start delay, scrapes);
- :mod:`.bench` -- ``pdctl autoscale-bench``: pd-operator's policy against baselines and
  a clairvoyant oracle (tests/benchmarks/README.md);
- :mod:`.simulate` -- ``pdctl simulate``: a PDInferenceService's autoscaling policy, and
  an edited one, on the same trace before applying the edit.

Not part of the operator's control loop: ``autoscale/`` stays pure (no I/O, no clock);
this package runs its code (``plan_service``) in virtual time.
"""
