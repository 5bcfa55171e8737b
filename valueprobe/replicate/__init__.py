"""The paper's experiments and the demo: orchestration of the layers below, one stage at a time."""
