using Microsoft.Extensions.Primitives;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// Signals when any certificate, key, session-ticket-key or client CA file in force changes on disk (a renewed
/// certificate, a rotated Kubernetes secret), so that it is reloaded without any configuration edit.
/// </summary>
internal sealed class CertificateFileWatch : IDisposable
{
    private readonly FilePoll _poll;

    /// <param name="settings">The settings whose files to watch.</param>
    /// <param name="since">A watch armed earlier whose view of the files to start from (see FilePoll).</param>
    public CertificateFileWatch(TernSettings settings, CertificateFileWatch? since = null) =>
        _poll = new FilePoll(settings.Certificates.SelectMany(c => new[] { c.CertificatePath, c.KeyPath })
            .Append(settings.SessionTicketKeysPath).Append(settings.TrustedClientCaPath).OfType<string>().Select(Path.GetFullPath).Distinct(), since?._poll);

    public IChangeToken Token => _poll.Token;

    public void Dispose() => _poll.Dispose();
}
