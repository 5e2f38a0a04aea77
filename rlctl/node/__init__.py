"""What runs on the job's nodes, not on the user's machine: ``jobenv`` (the job's Python
environment, the shipped wheel over the image's packages)."""
