"""``python -m composer_dynsample`` is the ``composer-dynsample`` command."""

from composer_dynsample.cli.main import main

if __name__ == "__main__":
    main()
