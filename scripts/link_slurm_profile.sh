#!/usr/bin/env bash
# Makes `snakemake --profile slurm` work as users type it, from any folder: Snakemake looks a
# profile NAME up in the working directory and then in its user config folder
# ($XDG_CONFIG_HOME/snakemake, usually ~/.config/snakemake), so this links profiles/slurm there
# as `slurm`. A link to this profile already there is kept; anything else of that name (another
# project's profile, a site profile) is never overwritten: the script stops and says so.
# `--profile profiles/slurm` works without this step.   Usage: make slurm-profile
set -euo pipefail
python=${PYTHON:-python3}
profile="$(cd "$(dirname "$0")/../profiles/slurm" && pwd -P)"
# the folder Snakemake itself searches (platformdirs, as snakemake.cli.get_profile_dir does)
config_dir="$("$python" -c 'from snakemake.common import get_appdirs; print(get_appdirs().user_config_dir)')"
link="$config_dir/slurm"
if [ -L "$link" ] && [ "$(readlink -f "$link")" = "$profile" ]; then
    echo "the Snakemake profile 'slurm' is already $link -> $profile"
    exit 0
fi
if [ -e "$link" ] || [ -L "$link" ]; then
    echo "error: $link exists and is not a link to $profile: not overwritten." >&2
    echo "Hint: use --profile $profile, or move $link away and run make slurm-profile again." >&2
    exit 1
fi
mkdir -p "$config_dir"
ln -s "$profile" "$link"
echo "linked the Snakemake profile 'slurm': $link -> $profile"
