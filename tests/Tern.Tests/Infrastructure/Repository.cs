namespace Tern.Tests.Infrastructure;

/// <summary>Paths in the source tree the tests run from.</summary>
public static class Repository
{
    public static string Root { get; } = FindRoot();

    private static string FindRoot()
    {
        for (var folder = new DirectoryInfo(AppContext.BaseDirectory); folder is not null; folder = folder.Parent)
        {
            if (File.Exists(Path.Combine(folder.FullName, "Tern.sln")))
            {
                return folder.FullName;
            }
        }

        throw new InvalidOperationException($"Tern.sln not found above {AppContext.BaseDirectory}");
    }
}
