"""The ``composer-dynsample`` application: the command line and the work behind each command.

- :mod:`~composer_dynsample.cli.main`: argument parsing and the entry point, ``main``;
- :mod:`~composer_dynsample.cli.commands`: ``train``, ``eval``, and what the commands that read a checkpoint share;
- :mod:`~composer_dynsample.cli.embed`, :mod:`~composer_dynsample.cli.export`, :mod:`~composer_dynsample.cli.mine`
  and :mod:`~composer_dynsample.cli.convert`: a command each;
- :mod:`~composer_dynsample.cli.training`: the training run and its report;
- :mod:`~composer_dynsample.cli.resume`: the checkpoint a run loads, ``trainer.autoresume``, the save on a signal;
- :mod:`~composer_dynsample.cli.run_dir`: the run directory, its lock and its outputs;
- :mod:`~composer_dynsample.cli.reporting`: metric tables and JSON; :mod:`~composer_dynsample.cli.plots`: PNG plots;
- :mod:`~composer_dynsample.cli.inputs`: the files ``embed`` reads.

The library (samplers, algorithms, miners, models, data, config builders) never imports from here.
"""
