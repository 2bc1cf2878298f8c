#!/bin/sh
# Refuses to go on while a secret is empty, the example's placeholder or too weak: a stack started
# from docker/.env.example's change-me values would let anyone who has read the example sign admin
# tokens (the JWT secret), sign in (the admin password) or read stored connections (the Fernet key).
# Run by airflow-init and s3-users before they use anything; never prints a value.
#
#   check-secrets.sh NAME:MIN_LENGTH ... NAME:fernet
set -eu

failed=0
for spec in "$@"; do
    name=${spec%%:*}
    rule=${spec#*:}
    case $name in
        '' | *[!A-Za-z0-9_]*) echo "check-secrets.sh: not a variable name in '$spec'" >&2; exit 2 ;;
    esac
    eval "value=\${$name-}"
    problem=
    if [ -z "$value" ]; then
        problem="is empty"
    else
        case $value in
            change-me* | changeme* | CHANGE-ME* | CHANGEME*) problem="is still the example's placeholder" ;;
        esac
    fi
    if [ -z "$problem" ] && [ "$rule" = fernet ]; then
        # Fernet.generate_key(): 32 random bytes as URL-safe base64, 43 characters and one "=".
        body=${value%=}
        case $body in
            *[!A-Za-z0-9_-]*) problem="is not a Fernet key (44 characters of URL-safe base64)" ;;
            *) [ ${#value} -eq 44 ] && [ ${#body} -eq 43 ] || problem="is not a Fernet key (44 characters of URL-safe base64)" ;;
        esac
    elif [ -z "$problem" ] && [ ${#value} -lt "$rule" ]; then
        problem="is too short (${#value} characters, at least $rule needed)"
    fi
    if [ -n "$problem" ]; then
        echo "olmocr-airflow: refusing to start: $name $problem." >&2
        failed=1
    fi
done
if [ "$failed" -ne 0 ]; then
    echo "olmocr-airflow: make fresh secrets with 'make docker-env' (scripts/docker-env.py writes every missing or placeholder secret into docker/.env and keeps the ones you set), then start the stack again." >&2
    exit 1
fi
