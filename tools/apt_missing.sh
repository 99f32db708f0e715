# Sourced by tools/*.sh: install_missing WHAT PACKAGE... installs the Debian packages not yet installed
# (sudo when not root), saying which; nothing when all are there.
install_missing() {
    local what=$1
    shift
    local missing
    missing=$(for deb in "$@"; do dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "ok installed" || echo "$deb"; done)
    if [ -n "$missing" ]; then
        echo "$what: installing Debian packages: $missing"
        local sudo=""
        if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
        $sudo apt-get update -qq
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
    fi
}
