using System.Net.Security;
using System.Runtime.CompilerServices;
using System.Security.Authentication;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.AspNetCore.Server.Kestrel.Https;
using Microsoft.Extensions.Logging;
using Tern.Proxy.Configuration;
using Tern.Proxy.Tls.OpenSsl;

namespace Tern.Proxy.Tls;

/// <summary>Entry point of the TLS feature on a Kestrel listener.</summary>
public static class TlsListenOptionsExtensions
{
    private static readonly List<SslApplicationProtocol> s_h2AndHttp11 = [SslApplicationProtocol.Http2, SslApplicationProtocol.Http11];
    private static readonly List<SslApplicationProtocol> s_http11 = [SslApplicationProtocol.Http11];

    /// <summary>
    /// Terminates TLS on this listener with the engine and certificates in force (Tern:Tls), the
    /// certificate chosen per connection by SNI, so that a certificate reload applies to the next
    /// handshake without touching open connections.
    /// </summary>
    public static ListenOptions UseTernTls(this ListenOptions listenOptions)
    {
        ArgumentNullException.ThrowIfNull(listenOptions);
        var services = listenOptions.ApplicationServices;
        var active = services.GetRequiredService<ActiveConfiguration>();
        if (active.Current.Settings.TlsEngine == TlsEngines.OpenSsl)
        {
            var engine = services.GetRequiredService<OpenSslEngine>();
            var metrics = services.GetRequiredService<TlsMetrics>();
            var logger = services.GetRequiredService<ILoggerFactory>().CreateLogger("Tern.Proxy.Tls");
            listenOptions.Use(next => new OpenSslTlsMiddleware(next, active, engine, metrics, logger).OnConnectionAsync);
            return listenOptions;
        }

        return listenOptions.UseSslStream(active, services.GetRequiredService<ILoggerFactory>().CreateLogger("Tern.Proxy.Tls"));
    }

    private static ListenOptions UseSslStream(this ListenOptions listenOptions, ActiveConfiguration configuration, ILogger logger)
    {
        var protocols = listenOptions.Protocols.HasFlag(HttpProtocols.Http2) ? s_h2AndHttp11 : s_http11;

        // One options object per certificate and listener, built on first use and reused by every
        // handshake: SslStream copies what it needs, and rebuilding per connection costs allocations.
        // With client certificates on, options are per connection, so that a refusal is logged with
        // the connection it refused.
        var cache = new ConditionalWeakTable<ServerCertificate, SslServerAuthenticationOptions>();
        listenOptions.UseHttps(new TlsHandshakeCallbackOptions
        {
            HandshakeTimeout = configuration.Current.Settings.HandshakeTimeout,
            OnConnection = context =>
            {
                var snapshot = configuration.Current;
                var certificate = snapshot.Certificates.Select(context.ClientHelloInfo.ServerName);
                return ValueTask.FromResult(snapshot.ClientCertificates.Mode == ClientCertificateMode.None
                    ? cache.GetValue(certificate, c => Options(c, protocols, ClientCertificateTrust.None, context.Connection, logger))
                    : Options(certificate, protocols, snapshot.ClientCertificates, context.Connection, logger));
            },
        });
        return listenOptions;
    }

    private static SslServerAuthenticationOptions Options(ServerCertificate certificate, List<SslApplicationProtocol> protocols, ClientCertificateTrust trust,
        Microsoft.AspNetCore.Connections.ConnectionContext connection, ILogger logger)
    {
        var options = new SslServerAuthenticationOptions
        {
            ServerCertificateContext = certificate.StreamContext,
            ApplicationProtocols = protocols,
            EnabledSslProtocols = SslProtocols.Tls12 | SslProtocols.Tls13,
            CertificateRevocationCheckMode = System.Security.Cryptography.X509Certificates.X509RevocationMode.NoCheck,
            AllowRenegotiation = false,
            ClientCertificateRequired = trust.Mode != ClientCertificateMode.None,
        };

        if (trust.Mode != ClientCertificateMode.None)
        {
            options.CertificateChainPolicy = trust.ChainPolicy();
            options.RemoteCertificateValidationCallback = (_, presented, chain, errors) =>
            {
                if (trust.Accepts(presented, chain, errors, out var reason))
                {
                    return true;
                }

                TernLog.ClientCertificateRefused(logger, connection.ConnectionId, connection.RemoteEndPoint?.ToString() ?? "-", reason!);
                return false;
            };
        }

        return options;
    }
}
