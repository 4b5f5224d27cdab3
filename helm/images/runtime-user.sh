#!/bin/sh
# Creates an image's runtime user: NAME with uid = gid = ID, replacing whatever user and group the
# base image already has at that id. Ubuntu 24.04 images (and so nvidia/cuda's) ship user and
# group `ubuntu` at 1000:1000, where a plain `groupadd --gid 1000` fails the build; Debian's slim
# images (python:3.11-slim-bookworm) have nobody at 1000. The pods run as ID (runAsUser and
# runAsGroup), so the name only has to resolve: getpass.getuser(), which torch's compile caches
# call, raises for a uid without a passwd entry.
#
# usage: runtime-user.sh [--create-home] NAME ID [PREFIX]
#   --create-home  give the user /home/NAME (the code location's Dagster processes write there)
#   PREFIX         edit PREFIX/etc/{passwd,group,shadow,gshadow} instead of /etc, as shadow's
#                  --prefix does; the tests run this script on copies of the base images' files
set -eu

create_home=--no-create-home
if [ "${1:-}" = "--create-home" ]; then
    create_home=--create-home
    shift
fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 [--create-home] NAME ID [PREFIX]" >&2
    exit 2
fi
name=$1
id=$2
prefix=${3:-}
case $id in
    '' | *[!0-9]*) echo "$0: ID must be a number, got '$id'" >&2; exit 2 ;;
esac

# Runs a shadow tool on PREFIX's files when one is given.
shadow() {
    tool=$1
    shift
    if [ -n "$prefix" ]; then
        "$tool" --prefix "$prefix" "$@"
    else
        "$tool" "$@"
    fi
}

# The name of the entry at ID in /etc/$1 (passwd or group), if any.
entry_at() {
    awk -F: -v id="$id" '$3 == id { print $1; exit }' "$prefix/etc/$1"
}

user=$(entry_at passwd)
if [ -n "$user" ]; then
    # Its home (/home/ubuntu) stays behind, owned by ID: harmless, and the new user owns it.
    shadow userdel "$user"
fi
# userdel removes a same-named private group only where login.defs says USERGROUPS_ENAB yes, and
# a group at ID may exist without a user: look again.
group=$(entry_at group)
if [ -n "$group" ]; then
    shadow groupdel "$group"
fi
shadow groupadd --gid "$id" "$name"
shadow useradd --uid "$id" --gid "$id" "$create_home" --shell /usr/sbin/nologin "$name"
