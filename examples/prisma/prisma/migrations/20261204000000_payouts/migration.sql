-- CreateTable
CREATE TABLE "payouts" (
    "id" SERIAL NOT NULL,
    "account" TEXT NOT NULL,
    "amount" INTEGER NOT NULL,

    CONSTRAINT "payouts_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "ledger_entries" (
    "id" SERIAL NOT NULL,
    "account" TEXT NOT NULL,
    "amount" INTEGER NOT NULL,

    CONSTRAINT "ledger_entries_pkey" PRIMARY KEY ("id")
);
