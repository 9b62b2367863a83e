"""The studies' runner: ``python experiments/run.py list | start STUDY [ARGS...] | status``.

Starts a study in the background under nice with its command and commit first in its log
(runs/studies/<study>.log); every study resumes from its kept stages when started again
(spec_drafters/studies/runner.py, stages.py)."""

from spec_drafters.studies.runner import main

if __name__ == "__main__":
    main()
