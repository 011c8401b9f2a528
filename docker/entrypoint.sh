#!/bin/sh
# Entry point of the orchestrate worker image (docker/Dockerfile): turn the container into an SSH
# host that `orchestrate` can log in to with one key, then run sshd in the foreground.
#
#   1. collect the authorized public key(s) from AUTHORIZED_KEYS and/or AUTHORIZED_KEYS_FILE;
#      refuse to start (exit 2) without a valid one
#   2. create a host key in SSHD_HOST_KEY_DIR unless one is there (a volume keeps it across
#      container re-creation, so known_hosts stays valid)
#   3. write SSHD_CONFIG_DIR/sshd_config: key-only login for SSH_USER, no passwords, no PAM
#   4. make sure WORK_DIR exists and belongs to SSH_USER
#   5. exec sshd -D -e: sshd replaces this script (signals reach it directly), logs to stderr
#
# With arguments, it runs them instead (`docker run IMAGE python -c ...`) and starts no sshd.
#
# Every path and the port come from the environment, so the same script runs outside a
# container too (the tests run it as root with a free port on 127.0.0.1 and temporary dirs):
#
#   SSH_USER              trainer                    the only account allowed to log in
#   SSHD_PORT             22
#   SSHD_LISTEN_ADDRESS   0.0.0.0
#   SSHD_CONFIG_DIR       /etc/ssh/orchestrate       generated sshd_config and authorized_keys;
#                                                    it and its parents must be root-owned and
#                                                    not group/world-writable (StrictModes)
#   SSHD_HOST_KEY_DIR     /etc/ssh/host-keys         ssh_host_ed25519_key, created if missing
#   AUTHORIZED_KEYS_FILE  /run/secrets/authorized_keys  public key file(s), read if present
#   AUTHORIZED_KEYS       (empty)                    public key line(s), added to the file's
#   WORK_DIR              ~SSH_USER/orchestrate      created and given to SSH_USER if needed
#   SSHD_BIN              /usr/sbin/sshd             absolute path: sshd re-executes itself
#
# Exit status 2: a configuration problem, explained on stderr; sshd was not started.
set -eu

PROG=orchestrate-entrypoint

say() {
    printf '%s: %s\n' "$PROG" "$*" >&2
}

fail() {
    say "$*"
    exit 2
}

if [ "$#" -gt 0 ]; then
    exec "$@"
fi

SSH_USER=${SSH_USER:-trainer}
SSHD_PORT=${SSHD_PORT:-22}
SSHD_LISTEN_ADDRESS=${SSHD_LISTEN_ADDRESS:-0.0.0.0}
SSHD_CONFIG_DIR=${SSHD_CONFIG_DIR:-/etc/ssh/orchestrate}
SSHD_HOST_KEY_DIR=${SSHD_HOST_KEY_DIR:-/etc/ssh/host-keys}
AUTHORIZED_KEYS_FILE=${AUTHORIZED_KEYS_FILE:-/run/secrets/authorized_keys}
AUTHORIZED_KEYS=${AUTHORIZED_KEYS:-}
SSHD_BIN=${SSHD_BIN:-/usr/sbin/sshd}
WORK_DIR=${WORK_DIR:-}

# ------------------------------------------------------------------ check the settings

case "$SSH_USER" in
    '' | -* | *[!A-Za-z0-9._-]*)
        fail "SSH_USER='$SSH_USER' is not a plain user name (letters, digits, '.', '_', '-')" ;;
esac
case "$SSHD_PORT" in
    '' | *[!0-9]*) fail "SSHD_PORT='$SSHD_PORT' is not a port number" ;;
esac
if [ "$SSHD_PORT" -lt 1 ] || [ "$SSHD_PORT" -gt 65535 ]; then
    fail "SSHD_PORT=$SSHD_PORT is not between 1 and 65535"
fi
# check_word NAME VALUE [path]: VALUE goes into sshd_config verbatim, so no spaces, quotes or
# '%' (sshd's token character); with "path", it must be absolute too.
check_word() {
    case "$2" in
        '' | *[[:space:]\"\'%]*) fail "$1='$2' must be non-empty, without spaces, quotes or '%'" ;;
    esac
    case "${3:-}:$2" in
        path:/*) ;;
        path:*) fail "$1='$2' must be an absolute path" ;;
    esac
}
check_word SSHD_LISTEN_ADDRESS "$SSHD_LISTEN_ADDRESS"
check_word SSHD_CONFIG_DIR "$SSHD_CONFIG_DIR" path
check_word SSHD_HOST_KEY_DIR "$SSHD_HOST_KEY_DIR" path
check_word SSHD_BIN "$SSHD_BIN" path

# ------------------------------------------------------------------ the authorized keys

keys=$AUTHORIZED_KEYS
if [ -d "$AUTHORIZED_KEYS_FILE" ]; then
    fail "AUTHORIZED_KEYS_FILE=$AUTHORIZED_KEYS_FILE is a directory, not a key file. Docker" \
        "creates an empty directory when a bind-mounted file is missing on the host: create" \
        "the key first (docker/make-client-key.sh), remove that directory, and recreate the" \
        "container."
elif [ -e "$AUTHORIZED_KEYS_FILE" ]; then
    [ -r "$AUTHORIZED_KEYS_FILE" ] || fail "cannot read AUTHORIZED_KEYS_FILE=$AUTHORIZED_KEYS_FILE"
    keys="$keys
$(cat "$AUTHORIZED_KEYS_FILE")"
fi
# Drop blank lines, comments and Windows line ends.
keys=$(printf '%s\n' "$keys" | tr -d '\r' | grep -v -e '^[[:space:]]*$' -e '^[[:space:]]*#' || true)
if [ -z "$keys" ]; then
    fail "no authorized key: mount the controller's public key at $AUTHORIZED_KEYS_FILE" \
        "(docker/compose.yaml mounts docker/client_key.pub there; create it with" \
        "docker/make-client-key.sh) or put the key line in AUTHORIZED_KEYS. Refusing to start" \
        "an sshd that nobody can log in to."
fi
case "$keys" in
    *"PRIVATE KEY"*)
        fail "the authorized keys contain a PRIVATE key; give the public key (the .pub file)" ;;
esac
command -v ssh-keygen >/dev/null 2>&1 || fail "ssh-keygen not found (install openssh-client)"
line_number=0
fingerprints=""
while IFS= read -r line; do
    line_number=$((line_number + 1))
    if ! fingerprint=$(printf '%s\n' "$line" | ssh-keygen -l -f - 2>/dev/null); then
        fail "authorized key line $line_number is not a public key: $(printf '%.60s' "$line")"
    fi
    fingerprints="$fingerprints
  $fingerprint"
done <<EOF
$keys
EOF

# ------------------------------------------------------------------ the account and sshd

[ "$(id -u)" -eq 0 ] || fail "must run as root: sshd switches to $SSH_USER for each login"
passwd_entry=$(getent passwd "$SSH_USER") || fail "no such user: SSH_USER=$SSH_USER"
user_uid=$(printf '%s\n' "$passwd_entry" | cut -d: -f3)
user_gid=$(printf '%s\n' "$passwd_entry" | cut -d: -f4)
user_home=$(printf '%s\n' "$passwd_entry" | cut -d: -f6)
# With UsePAM no, sshd itself rejects accounts whose password field starts with '!' (locked),
# even for key logins. '*' also rules out password logins but lets keys through.
password_field=$(getent shadow "$SSH_USER" | cut -d: -f2 || true)
case "$password_field" in
    '!'*)
        fail "the account $SSH_USER is locked ('!' in /etc/shadow), so sshd would refuse its" \
            "key logins too; unlock it without a password: usermod -p '*' $SSH_USER" ;;
esac
[ -x "$SSHD_BIN" ] || fail "sshd not found at SSHD_BIN=$SSHD_BIN (install openssh-server)"
if [ "$SSH_USER" = root ]; then
    permit_root=prohibit-password
else
    permit_root=no
fi

# ------------------------------------------------------------------ files

# sshd's privilege-separation directory; /run is often a fresh tmpfs.
[ -d /run/sshd ] || install -d -m 0755 /run/sshd

mkdir -p "$SSHD_CONFIG_DIR" "$SSHD_HOST_KEY_DIR"
chmod 0755 "$SSHD_CONFIG_DIR" # SSH_USER must read authorized_keys in it
chmod 0700 "$SSHD_HOST_KEY_DIR"

host_key=$SSHD_HOST_KEY_DIR/ssh_host_ed25519_key
if [ ! -s "$host_key" ]; then
    rm -f "$host_key" "$host_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "orchestrate-worker@$(uname -n)" -f "$host_key"
    say "created host key $host_key"
fi
say "host key $(ssh-keygen -l -f "$host_key.pub")"

authorized_keys=$SSHD_CONFIG_DIR/authorized_keys
printf '%s\n' "$keys" >"$authorized_keys.tmp"
chmod 0644 "$authorized_keys.tmp"
mv -f "$authorized_keys.tmp" "$authorized_keys"
say "authorized for $SSH_USER:$fingerprints"

if [ -z "$WORK_DIR" ]; then
    WORK_DIR=$user_home/orchestrate
fi
mkdir -p "$WORK_DIR"
# A fresh bind mount or volume may belong to root; only the directory itself is handed over.
if [ "$(stat -c %u "$WORK_DIR")" != "$user_uid" ]; then
    chown "$user_uid:$user_gid" "$WORK_DIR"
fi

config=$SSHD_CONFIG_DIR/sshd_config
write_config() {
    cat >"$config.tmp" <<EOF
# Written by $PROG at every start; edits here are lost. Set its environment variables instead.
Port $SSHD_PORT
ListenAddress $SSHD_LISTEN_ADDRESS
HostKey $host_key
AuthorizedKeysFile $authorized_keys
AllowUsers $SSH_USER
PermitRootLogin $permit_root
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
PermitEmptyPasswords no
# PAM brings pam_loginuid & co, which fail in unprivileged containers; keys need no PAM.
UsePAM no
StrictModes yes
PidFile none
PrintMotd no
PrintLastLog no
UseDNS no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
PermitTunnel no
# orchestrate uploads scripts and copies checkpoints over SFTP.
Subsystem sftp internal-sftp
LogLevel INFO
$1
EOF
    mv -f "$config.tmp" "$config"
}

write_config ""
# OpenSSH >= 9.8 refuses, for a while, sources whose connections end without logging in or fail
# to; every connection to these containers comes from the one Docker gateway address, so a few
# failed attempts would lock the controller out. Turn it off where the option exists.
if "$SSHD_BIN" -t -f "$config" -o PerSourcePenalties=no >/dev/null 2>&1; then
    write_config "PerSourcePenalties no"
fi
if ! problems=$("$SSHD_BIN" -t -f "$config" 2>&1); then
    fail "sshd rejects the generated $config: $problems"
fi

say "sshd listening on $SSHD_LISTEN_ADDRESS:$SSHD_PORT; key-only login as $SSH_USER;" \
    "work directory $WORK_DIR"
exec "$SSHD_BIN" -D -e -f "$config"
