# syntax=docker/dockerfile:1
#
# Tern container image (multi-stage).
#
#   docker build -t tern .
#   docker run --rm --read-only --tmpfs /tmp \
#     -p 8443:8443 -p 8080:8080 -p 9090:9090 tern
#
# Base images: the .NET 10 images at mcr.microsoft.com are Ubuntu 24.04
# ("noble") based -- Microsoft ships no Debian images for .NET 10 -- so the
# distro is pinned explicitly with the -noble suffix. apt-get works as usual.
#
# The native library (libtern_tls.so) is compiled in the build stage for the
# platform being built, so do not add --platform=$BUILDPLATFORM to the build
# stage: multi-arch images must build each architecture natively (or under
# emulation).

############################ build ############################
FROM mcr.microsoft.com/dotnet/sdk:10.0-noble AS build

# Toolchain for src/Native (CMake + C compiler + OpenSSL 3 headers), driven by
# src/Native/Native.targets during publish. --no-install-recommends leaves out
# make and the libc headers, so they are listed explicitly.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake make gcc libc6-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# The whole (filtered, see .dockerignore) tree is copied at once: shared
# MSBuild files (Directory.*.props, NuGet.config, ...) and src/Native must be
# present for restore and publish anyway. The NuGet cache mount keeps package
# downloads between builds.
COPY . .

RUN --mount=type=cache,id=tern-nuget,target=/root/.nuget/packages \
    dotnet restore src/Proxy/Tern.Proxy.csproj

RUN --mount=type=cache,id=tern-nuget,target=/root/.nuget/packages \
    dotnet publish src/Proxy/Tern.Proxy.csproj -c Release -o /app --no-self-contained \
 && test -f /app/Tern.Proxy.dll \
 && test -f /app/libtern_tls.so \
 && test -f /app/config/appsettings.json

############################ runtime ############################
# The aspnet image already carries the OpenSSL 3 runtime (libssl3t64).
FROM mcr.microsoft.com/dotnet/aspnet:10.0-noble AS runtime

# The image sets ASPNETCORE_HTTP_PORTS=8080; Tern configures its own
# listeners (Tern__Https__Port / Tern__Http__Port / Tern__Management__Port),
# so clear it to avoid a second, conflicting binding source.
ENV ASPNETCORE_HTTP_PORTS=

# Where the self-signed fallback certificate goes when no certificate is
# configured. /tmp is then the only path that must be writable, so the
# container can run with a read-only root file system (docker run --read-only
# --tmpfs /tmp ...). Better: mount a real certificate and set
# Tern__Tls__Certificates__<name>__CertificatePath and __KeyPath.
ENV Tern__Tls__SelfSignedDirectory=/tmp/tern/certs

WORKDIR /app
# Files stay owned by root and read-only for the runtime user.
COPY --from=build /app ./

# HTTPS, HTTP (redirects to HTTPS), management (/healthz, /readyz).
EXPOSE 8443 8080 9090

# Non-root: the image's built-in "app" user (APP_UID/APP_GID 1654). Numeric
# so Kubernetes' runAsNonRoot can verify it.
USER 1654:1654

# No HEALTHCHECK: the runtime image has no curl/wget. Probe
# http://<container>:9090/healthz (liveness) and /readyz (readiness) from
# the orchestrator instead.
ENTRYPOINT ["dotnet", "Tern.Proxy.dll"]
