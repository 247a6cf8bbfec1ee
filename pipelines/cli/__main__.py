import sys

from rota.pipelines.cli.main import main

sys.exit(main())
