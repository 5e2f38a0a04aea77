"""The job stage: a recipe and its plan made into one job, once (``prepared.Prepared``).

``spec``: the backend-neutral ``JobSpec`` (paths, layout, the engine config, setup);
``render``: what a backend's render returns; ``files``: the files shipped with a job;
``preflight``: the pre-flight command on the nodes; ``images``: the container image;
``wheel``: the rlctl wheel shipped with the job.
"""
