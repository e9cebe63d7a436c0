using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Primitives;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// Signals when any certificate, key, session-ticket-key or client CA file changes on disk (a renewed
/// certificate, a rotated Kubernetes secret), so that it is reloaded without any configuration edit.
/// </summary>
internal sealed class CertificateFileWatch : IDisposable
{
    private readonly FilePoll _poll;

    /// <param name="files">The files, as <see cref="Files"/> names them.</param>
    /// <param name="since">A watch armed earlier whose view of the files to start from (see FilePoll).</param>
    public CertificateFileWatch(IEnumerable<string> files, CertificateFileWatch? since = null) =>
        _poll = new FilePoll(files.Distinct(), since?._poll);

    public IChangeToken Token => _poll.Token;

    /// <summary>The certificate, key, session-ticket-key and client CA files of settings, as full paths.</summary>
    public static IEnumerable<string> Files(TernSettings settings) =>
        settings.Certificates.SelectMany(c => new[] { c.CertificatePath, c.KeyPath })
            .Append(settings.SessionTicketKeysPath).Append(settings.TrustedClientCaPath).OfType<string>().SelectMany(FullPath);

    /// <summary>
    /// The files a load of configuration will read, known before it reads them, so that a watch can
    /// be armed first: a file renewed while it is read is then seen, whatever the load decides.
    /// </summary>
    public static IEnumerable<string> FilesToRead(IConfiguration configuration) => Files(TernSettings.Read(new SettingReader(configuration)));

    public void Dispose() => _poll.Dispose();

    // A path the load will reject (a NUL in it) is not watched; the load reports it.
    private static IEnumerable<string> FullPath(string path)
    {
        try
        {
            return [Path.GetFullPath(path)];
        }
        catch (ArgumentException)
        {
            return [];
        }
    }
}
