"""What the docs generate when they build (``mkdocs_hooks.py``).

* :mod:`~ctiflow.jobs.tools.docs_examples` — worked examples run through the real job runtime.
* :mod:`~ctiflow.jobs.tools.reference_doc` — the job file reference from the configuration model.
"""
