import sys

try:
    from infra.cli import main
except KeyboardInterrupt:  # Ctrl-C (the process group's SIGINT) while still starting up: as
    # main() would say it, not a traceback (a provision's `wait` child is started late)
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
