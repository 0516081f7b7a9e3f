"""A whole job from Python: ``run_job(JobSpec(input, output, ...))`` runs what
``shardscribe transcribe`` runs (preflight, the output's lock, resume, the run, the
commit) and returns its summary; ``run_pseudo_label`` adds the pseudo-label exports.
Refusals and failures are JobError (one line each). The display is the caller's: the
command line (jobs/) passes its console in as ``log`` and ``on_progress``."""
from __future__ import annotations

from .pseudo_label import export_pseudo_labels, pseudo_label_spec, run_pseudo_label
from .run import run_job
from .spec import (JobConsole, JobError, JobFailed, JobIncomplete, JobInterrupted, JobProgress, JobSpec,
                   JobSummary)

__all__ = ["JobConsole", "JobError", "JobFailed", "JobIncomplete", "JobInterrupted", "JobProgress", "JobSpec",
           "JobSummary", "export_pseudo_labels", "pseudo_label_spec", "run_job", "run_pseudo_label"]
