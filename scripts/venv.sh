# Sourced by demo.sh and test.sh: create/activate the venv and install CPU torch plus hfspec with extras "$1".
VENV="${HFSPEC_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[$1]"
