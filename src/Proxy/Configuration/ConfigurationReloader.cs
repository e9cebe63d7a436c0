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
    ConfigurationGate gate,
    [FromKeyedServices(ConfigurationSnapshot.LoggingSection)] ConfigurationGate logging,
    OpenSslEngine openSsl,
    ProxyConfigOutcome yarp,
    CertificateFileWatch initial,
    ILogger<ConfigurationReloader> logger) : IHostedService, IDisposable
{
    // Editors and ConfigMap updates fire several change events per save; settle first.
    private static readonly TimeSpan s_settle = TimeSpan.FromMilliseconds(250);
    private static readonly TimeSpan s_yarpVerdictTimeout = TimeSpan.FromSeconds(10);
    private readonly Lock _lock = new();
    private IDisposable? _subscription;
    private CertificateFileWatch? _certificates;
    private Timer? _timer;

    public Task StartAsync(CancellationToken cancellationToken)
    {
        _timer = new Timer(_ => Apply(), null, Timeout.Infinite, Timeout.Infinite);
        _subscription = ChangeToken.OnChange(live.GetReloadToken, Schedule);
        lock (_lock)
        {
            // From the view of the watch armed before the first load read the files: a renewal
            // landing while Tern started is seen.
            _certificates = initial;
            WatchCertificates(keepView: true);
        }

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
            initial.Dispose(); // if Tern never started; once more is harmless
        }
    }

    private void Schedule()
    {
        try
        {
            _timer?.Change(s_settle, Timeout.InfiniteTimeSpan);
        }
        catch (ObjectDisposedException)
        {
            // A change seen while Tern stops: nothing to reload.
        }
    }

    /// <summary>
    /// Watches the certificate files of the configuration in force and any others given (called
    /// under the lock). The new watch is armed before the old one goes, so that no change falls
    /// between the two. With keepView, it starts from the old watch's view of the files they
    /// share, not from what they hold now, so that a change made since the old watch was armed is
    /// still seen.
    /// </summary>
    private void WatchCertificates(bool keepView = false, IEnumerable<string>? more = null)
    {
        var previous = _certificates;
        _certificates = new CertificateFileWatch(CertificateFileWatch.Files(active.Current.Settings).Concat(more ?? []), keepView ? previous : null);
        _certificates.Token.RegisterChangeCallback(_ => Schedule(), null);
        previous?.Dispose();
    }

    internal void Apply()
    {
        lock (_lock)
        {
            // A file token fires once, and the one that scheduled this reload has fired: re-arm it
            // before the files are read, on the files in force and those this reload will read, so
            // that a renewal landing while they are read (a key written after its certificate)
            // schedules another reload instead of going unseen.
            var toRead = CertificateFileWatch.FilesToRead(live).ToList();
            WatchCertificates(more: toRead);
            try
            {
                ApplyLocked();
            }
            catch (Exception ex) when (ex is not OutOfMemoryException)
            {
                // A fault in a check, not in the settings: this runs on a timer thread, where an
                // exception would end the process; Tern serves on with what it has.
                TernLog.ReloadFailed(logger, ex, ex.Message);
            }
            finally
            {
                // Again, keeping the view from before the read: a file that changed after it (say
                // during YARP's verdict) still schedules a reload. The files this reload read stay
                // watched even if it was rejected: settings may name files a deployment writes
                // later, and their arrival must bring the reload back.
                WatchCertificates(keepView: true, more: toRead);
            }
        }
    }

    private void ApplyLocked()
    {
        {
            var snapshot = ConfigurationSnapshot.TryLoad(live, out var problems, out var unread);
            // Those not named already, as they are now (at start or by the last reload applied: a
            // value changed under an ignored key is named again), and also when the change is
            // rejected: a misspelt key is often why.
            foreach (var ignored in unread.Except(active.Current.Unread))
            {
                TernLog.Unread(logger, ignored);
            }

            if (snapshot is not null && active.Bound.TlsEngine == TlsEngines.OpenSsl)
            {
                // Build the native contexts now: a certificate OpenSSL rejects must fail the reload.
                // The engine that serves is the one bound at start, whatever a reload asked for.
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

            foreach (var (key, value) in snapshot.Settings.StartOnlySettings(active.Bound.TlsEngine).Except(active.Bound.StartOnlySettings(active.Bound.TlsEngine)))
            {
                TernLog.RestartNeeded(logger, key, value);
            }

            if (!snapshot.ReverseProxy.SequenceEqual(active.Current.ReverseProxy))
            {
                // YARP parses and validates routes and clusters itself: wait for its verdict, and
                // put the last good section back if it said no.
                var verdict = yarp.Expect();
                gate.Publish(snapshot.ReverseProxy);
                var failure = verdict.Wait(s_yarpVerdictTimeout) ? verdict.Result : new TimeoutException("YARP did not apply the routes and clusters in time");
                if (failure is not null)
                {
                    var reasons = ProxyConfigOutcome.Reasons(failure).ToList();
                    foreach (var reason in reasons)
                    {
                        TernLog.ReloadProblem(logger, ReverseProxyValidator.Section, reason);
                    }

                    gate.Publish(active.Current.ReverseProxy);
                    TernLog.ReloadRejected(logger, reasons.Count);
                    return;
                }
            }

            if (snapshot.SelfSigned && !active.Current.SelfSigned)
            {
                // Every certificate was removed: say so as loudly as at start.
                TernLog.SelfSignedInUse(logger, snapshot.Settings.SelfSignedDirectory);
            }

            var previous = active.Current;
            active.Replace(snapshot);
            TernLog.Reloaded(logger, snapshot.Certificates.All.Count);
            if (!snapshot.Logging.SequenceEqual(previous.Logging))
            {
                PublishLogging(snapshot, previous);
            }
        }
    }

    /// <summary>
    /// Hands the Logging section to .NET's logging. An option its binder cannot convert (a
    /// CaptureScopes of "maybe") throws here, from the change callbacks: logged, and the section
    /// in force before is published again, so logging keeps its previous settings.
    /// </summary>
    private void PublishLogging(ConfigurationSnapshot snapshot, ConfigurationSnapshot previous)
    {
        try
        {
            logging.Publish(snapshot.Logging);
        }
        catch (Exception ex) when (ex is AggregateException or InvalidOperationException)
        {
            var reasons = ex is AggregateException aggregate ? aggregate.Flatten().InnerExceptions.Select(e => e.Message) : [ex.Message];
            logging.Publish(previous.Logging);
            TernLog.ReloadNotApplied(logger, ConfigurationSnapshot.LoggingSection, string.Join("; ", reasons));
        }
    }
}
