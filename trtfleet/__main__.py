"""``python -m trtfleet`` is the ``trtfleet`` command."""

from trtfleet.cli import main

raise SystemExit(main())
