using Microsoft.Extensions.FileProviders;
using Microsoft.Extensions.Primitives;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// Signals when any certificate, key, session-ticket-key or client CA file in force changes on disk (a renewed
/// certificate, a rotated Kubernetes secret), so that it is reloaded without any configuration edit.
/// </summary>
internal sealed class CertificateFileWatch : IDisposable
{
    private readonly List<PhysicalFileProvider> _providers = [];

    public CertificateFileWatch(TernSettings settings)
    {
        var tokens = new List<IChangeToken>();
        var files = settings.Certificates.SelectMany(c => new[] { c.CertificatePath, c.KeyPath })
            .Append(settings.SessionTicketKeysPath).Append(settings.TrustedClientCaPath).OfType<string>().Select(Path.GetFullPath);
        foreach (var folder in files.GroupBy(f => Path.GetDirectoryName(f)!))
        {
            if (!Directory.Exists(folder.Key))
            {
                continue;
            }

            var provider = new PhysicalFileProvider(folder.Key);
            _providers.Add(provider);
            tokens.AddRange(folder.Select(f => provider.Watch(Path.GetFileName(f))));
        }

        Token = new CompositeChangeToken(tokens);
    }

    public IChangeToken Token { get; }

    public void Dispose()
    {
        foreach (var provider in _providers)
        {
            provider.Dispose();
        }
    }
}
