"""``python -m agentrl_ext.env.launcher``: the ``agentrl-envs`` command."""

import sys

from agentrl_ext.env.launcher.command import main

sys.exit(main())
