using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Primitives;
using Tern.Proxy.Tls;
using Tern.Proxy.Tls.OpenSsl;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Re-checks the whole configuration when a source or a certificate file changes. A valid change is applied at once
/// (routes, clusters, certificates) without touching open connections; an invalid one is logged
/// problem by problem and the last good configuration stays in force.
/// </summary>
internal sealed class ConfigurationReloader(
    IConfiguration live,
    ActiveConfiguration active,
    ProxyConfigurationGate gate,
    OpenSslEngine openSsl,
    ILogger<ConfigurationReloader> logger) : IHostedService, IDisposable
{
    // Editors and ConfigMap updates fire several change events per save; settle first.
    private static readonly TimeSpan s_settle = TimeSpan.FromMilliseconds(250);
    private readonly Lock _lock = new();
    private IDisposable? _subscription;
    private CertificateFileWatch? _certificates;
    private Timer? _timer;

    public Task StartAsync(CancellationToken cancellationToken)
    {
        _timer = new Timer(_ => Apply(), null, Timeout.Infinite, Timeout.Infinite);
        _subscription = ChangeToken.OnChange(WatchAll, () => _timer.Change(s_settle, Timeout.InfiniteTimeSpan));
        return Task.CompletedTask;
    }

    public Task StopAsync(CancellationToken cancellationToken)
    {
        Dispose();
        return Task.CompletedTask;
    }

    public void Dispose()
    {
        _subscription?.Dispose();
        _timer?.Dispose();
        lock (_lock)
        {
            _certificates?.Dispose();
            _certificates = null;
        }
    }

    /// <summary>Configuration sources and the certificate files in force: any change triggers a re-check.</summary>
    private CompositeChangeToken WatchAll()
    {
        lock (_lock)
        {
            _certificates?.Dispose();
            _certificates = new CertificateFileWatch(active.Current.Settings);
            return new CompositeChangeToken([live.GetReloadToken(), _certificates.Token]);
        }
    }

    internal void Apply()
    {
        lock (_lock)
        {
            var snapshot = ConfigurationSnapshot.TryLoad(live, out var problems);
            if (snapshot is not null && active.Current.Settings.TlsEngine == TlsEngines.OpenSsl)
            {
                // Build the native contexts now: a certificate OpenSSL rejects must fail the reload.
                var problem = TernHost.PrepareOpenSsl(openSsl, snapshot);
                if (problem is not null)
                {
                    problems = [problem];
                    snapshot = null;
                }
            }

            if (snapshot is null)
            {
                foreach (var problem in problems)
                {
                    TernLog.ReloadProblem(logger, problem.Key, problem.Message);
                }

                TernLog.ReloadRejected(logger, problems.Count);
                return;
            }

            var previous = active.Current.Settings;
            foreach (var (key, port) in snapshot.Settings.ListenerPorts().Except(previous.ListenerPorts()))
            {
                TernLog.RestartNeeded(logger, key, port.ToString(System.Globalization.CultureInfo.InvariantCulture));
            }

            if (snapshot.Settings.TlsEngine != previous.TlsEngine)
            {
                TernLog.RestartNeeded(logger, "Tern:Tls:Engine", snapshot.Settings.TlsEngine);
            }

            foreach (var key in snapshot.UnknownKeys)
            {
                TernLog.UnknownSetting(logger, key);
            }

            active.Replace(snapshot);
            gate.Publish(snapshot.ReverseProxy);
            TernLog.Reloaded(logger, snapshot.Certificates.All.Count);
        }
    }
}
