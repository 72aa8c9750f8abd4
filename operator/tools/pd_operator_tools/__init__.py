"""pd-operator's tools, apart from the runtime (``pd_operator``): nothing here
is imported by the operator.

- :mod:`.enginesim`    simulated vLLM/SGLang engines (HTTP, metrics, PD handshake)
                       on the calibrated performance model, started with the exact
                       command lines the operator renders;
- :mod:`.autoscalesim` the autoscaling simulator in virtual time: traces, the
                       simulated fleet, policies and baselines, the oracle,
                       reports (``pdctl autoscale-bench``, ``pdctl simulate``);
- :mod:`.loadgen`      ``pdctl bench``, a load generator for any OpenAI endpoint;
- :mod:`.generate`     generators of the CRD and the Helm chart's files;
- :mod:`.workload`     length distributions, arrivals, percentiles, goodput.
"""
