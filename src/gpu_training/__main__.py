from gpu_training.cli import main

raise SystemExit(main())
