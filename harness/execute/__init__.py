"""Where and how runs execute.

:mod:`~harness.execute.runner` works through a protocol's plan (claims, attempts, budget, records);
an *executor* places each unit on a device (:mod:`~harness.execute.local`: this machine;
:mod:`~harness.execute.ray`: the nodes of a Ray cluster); a *launcher* starts one run as a fresh
process on its machine (:mod:`~harness.execute.launchers`: ``spawn``, ``forkserver``) running
:mod:`~harness.execute.worker`; :mod:`~harness.execute.state` reads run states and progress from
the records. A further backend is one new file implementing :class:`~harness.execute.base.Executor`.
"""
