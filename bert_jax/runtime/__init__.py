"""What a run needs around the maths: files, preemption, resume, checkpoints, compilation.

files          local and gs:// paths, atomic writes, JSON
preemption     signals -> a checkpoint and exit code 75, across processes
resume         what a rerun of a workdir must agree with (config, data, mesh)
checkpoints    orbax checkpoints of params, optimizer state and the data iterator
compile_cache  JAX's persistent compilation cache
multihost      process groups: initialization, barriers, one writer
"""
