using Microsoft.AspNetCore.DataProtection;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// ASP.NET Core's Data Protection, set up the first time something is protected or unprotected
/// rather than when a protector is made. YARP makes its Cookie and CustomHeader affinity policies'
/// protectors at start, whether a cluster uses them or not, and making the key ring behind them
/// creates ~/.aspnet/DataProtection-Keys, or warns three times where the home folder is read-only
/// (the chart's containers). With this, only a proxy that protects an affinity key does either.
/// </summary>
internal sealed class DataProtectionOnFirstUse(Func<IDataProtectionProvider> create) : IDataProtectionProvider
{
    private readonly Lazy<IDataProtectionProvider> _provider = new(create);

    public IDataProtector CreateProtector(string purpose) => new Protector(_provider, [purpose]);

    private sealed class Protector(Lazy<IDataProtectionProvider> provider, string[] purposes) : IDataProtector
    {
        private readonly Lazy<IDataProtector> _protector = new(() => provider.Value.CreateProtector(purposes));

        public IDataProtector CreateProtector(string purpose) => new Protector(provider, [.. purposes, purpose]);

        public byte[] Protect(byte[] plaintext) => _protector.Value.Protect(plaintext);

        public byte[] Unprotect(byte[] protectedData) => _protector.Value.Unprotect(protectedData);
    }
}
