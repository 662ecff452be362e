# Sourced by the RUN steps of the Dockerfiles in deploy/ (bind-mounted at /build, never copied):
# use the build secrets when they are not empty.
#   build_ca   a CA bundle (machines whose downloads pass through TLS interception)
#   build_pip  a pip.conf with the machine's index settings (`./dev images` writes it from
#              `pip config list`, leaving out file:// locations the build cannot see)
# Secrets live under /run/secrets only for the one RUN step: no layer holds them.
if [ -s /run/secrets/build_ca ]; then
  export PIP_CERT=/run/secrets/build_ca SSL_CERT_FILE=/run/secrets/build_ca \
         REQUESTS_CA_BUNDLE=/run/secrets/build_ca
fi
if [ -s /run/secrets/build_pip ]; then
  export PIP_CONFIG_FILE=/run/secrets/build_pip
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
