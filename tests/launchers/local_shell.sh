#!/usr/bin/env bash
# A REMOTE_SHELL for tests: called as ssh is (`local_shell.sh HOST COMMAND...`), it drops HOST and runs COMMAND
# here, so the "hosts" of a HOSTFILE are processes of this machine.
shift
exec bash -c "$*"
