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
        listenOptions.Use(next => context => SslStreamFirstBytesAsync(context, next, configuration.Current.Settings.HandshakeTimeout, logger));
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

    /// <summary>
    /// Answers a plain-HTTP request with a 400 before SslStream sees it, and keeps a client's
    /// malformed hello out of the error log. SslStream takes a first record it cannot read as a
    /// ClientHello (plain HTTP, an empty handshake record, garbage) for a missing certificate and
    /// throws NotSupportedException ("must use a certificate with the associated private key"),
    /// which Kestrel logs as an error with a stack trace: any client could write one per
    /// connection. It is logged at Debug here, like any failed handshake.
    /// </summary>
    private static async Task SslStreamFirstBytesAsync(Microsoft.AspNetCore.Connections.ConnectionContext context, Microsoft.AspNetCore.Connections.ConnectionDelegate next,
        TimeSpan handshakeTimeout, ILogger logger)
    {
        var input = context.Transport.Input;
        System.IO.Pipelines.ReadResult read;
        try
        {
            using var timeout = new CancellationTokenSource(handshakeTimeout);
            read = await input.ReadAsync(timeout.Token);
            while (read.Buffer.FirstSpan is [not NotTls.HandshakeRecord, ..] && read.Buffer.Length < 16 && !read.IsCompleted)
            {
                input.AdvanceTo(read.Buffer.Start, read.Buffer.End); // a request line may come in pieces
                read = await input.ReadAsync(timeout.Token);
            }
        }
        catch (Exception ex) when (ex is OperationCanceledException or IOException or Microsoft.AspNetCore.Connections.ConnectionResetException)
        {
            return; // silent or gone before its first bytes: nothing to answer
        }

        var isPlainHttp = NotTls.IsPlainHttp(read.Buffer);
        input.AdvanceTo(read.Buffer.Start); // not examined: SslStream reads these bytes again at once
        if (isPlainHttp)
        {
            await NotTls.AnswerPlainHttpAsync(context, logger);
            return;
        }

        try
        {
            await next(context);
        }
        catch (NotSupportedException ex) when (ex.TargetSite?.DeclaringType == typeof(SslStream))
        {
            TernLog.HandshakeFailed(logger, context.ConnectionId, context.RemoteEndPoint?.ToString() ?? "-", "no ClientHello SslStream could read in the first record");
        }
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
