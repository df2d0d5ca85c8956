"""``python -m treellm``: the same as the ``treellm`` command."""

from treellm.cli import main

raise SystemExit(main())
